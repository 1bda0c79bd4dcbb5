//go:build !race

package migrate

import "testing"

// raceDetector: built with -race (see race_test.go).
const raceDetector = false

func skipUnderRace(*testing.T) {}
