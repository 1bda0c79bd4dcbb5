//go:build !race

package migrate

import "testing"

func skipUnderRace(*testing.T) {}
