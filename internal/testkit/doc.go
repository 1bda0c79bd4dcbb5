// Package testkit holds the small helpers that the tests of several
// packages share and that import no package of this module, so that any
// package's own (internal) tests can use them, zksession's and topo's
// included: the check that a decoder refuses a malformed record
// (malformed.go), the wait for a value on a channel (await.go), a
// NOTIFY_SOCKET listener that can tell each message's sender (notify.go), the tail of a failed test's log
// (logtail.go), the loop of a background load (until.go), a connection
// that counts the bytes it reads (countconn.go), the supervisor tests' worker's reply
// (workerreply.go) and the report of a
// benchmark that compares two ways of doing one thing (ratio.go).
package testkit
