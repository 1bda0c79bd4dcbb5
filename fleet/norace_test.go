//go:build !race

package fleet

import "testing"

func skipUnderRace(*testing.T) {}
