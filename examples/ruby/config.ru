# A Rack app served by Puma as a supervisor worker, unmodified: Puma takes
# the supervisor's socket with --bind-to-activated-sockets (LISTEN_FDS) and
# says READY=1 through Debian's ruby-sd-notify, which needs NOTIFY_SOCKET
# to be a filesystem path (the supervisor's are).
#
#   puma --config puma.rb --bind-to-activated-sockets only --workers 2 --threads 1:4 config.ru
#
# It answers every request with which worker process, supervisor generation
# and APP_TAG served it, as JSON, so tests can tell generations apart.
require "json"

sleep Float(ENV.fetch("APP_STARTUP_DELAY", "0"))

run lambda { |_env|
  body = JSON.generate(pid: Process.pid, gen: ENV["SHARDVISOR_GENERATION"].to_s, tag: ENV["APP_TAG"].to_s)
  [200, { "content-type" => "application/json" }, [body]]
}
