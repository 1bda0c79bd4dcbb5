package benchkit

import "testing"

func TestOf(t *testing.T) {
	if got := Of(nil); got != (Stat{}) {
		t.Fatalf("empty: %+v", got)
	}
	xs := make([]float64, 0, 200)
	for i := 200; i >= 1; i-- {
		xs = append(xs, float64(i))
	}
	got := Of(xs)
	if got != (Stat{N: 200, P50: 100, P99: 198, Max: 200}) {
		t.Fatalf("1..200: %+v", got)
	}
	if xs[0] != 200 {
		t.Fatal("Of sorted its argument")
	}
	if got := Of([]float64{7}); got != (Stat{N: 1, P50: 7, P99: 7, Max: 7}) {
		t.Fatalf("one value: %+v", got)
	}
}

func TestUserID(t *testing.T) {
	for i, want := range map[uint32]string{0: "u00000000", 42: "u00000042", 12345678: "u12345678", 123456789: "u123456789"} {
		if got := UserID(i); got != want {
			t.Errorf("UserID(%d) = %q, want %q", i, got, want)
		}
	}
}
