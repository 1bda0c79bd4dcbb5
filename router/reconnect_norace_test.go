//go:build !race

package router

import "testing"

func skipUnderRace(*testing.T) {}
