//go:build !race

package zksession_test

import "testing"

func skipUnderRace(*testing.T) {}
