// Package testkit holds the small helpers that the tests of several
// packages share and that import no package of this module, so that any
// package's own (internal) tests can use them, zksession's and topo's
// included: the check that a decoder refuses a malformed record
// (malformed.go) and the wait for a value on a channel (await.go).
package testkit
