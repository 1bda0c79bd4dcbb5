// Package archtest holds only tests: the architecture rules of
// docs/architecture.md, checked against the code (see arch_test.go).
package archtest
