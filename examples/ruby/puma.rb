# Puma settings for running under the shardvisor supervisor, whose listen
# socket outlives every worker generation.
#
# queue_requests false: hand every accepted connection straight to a
# thread, which reads and answers it. With Puma's default (true) a
# reactor holds accepted connections until their request has arrived, and
# on shutdown closes those whose first byte has not (Client#can_close?):
# during a generation swap that drops a request the new generation would
# have served. Behind a buffering proxy (nginx, HAProxy) nothing is lost by
# it: slow clients never reach Puma directly.
queue_requests false
