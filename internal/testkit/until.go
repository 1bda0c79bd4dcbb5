package testkit

// Until calls f(0), f(1), … until stop is closed (checked before each
// call) or f returns false: the loop of a test's background load.
func Until(stop <-chan struct{}, f func(i int) bool) {
	for i := 0; ; i++ {
		select {
		case <-stop:
			return
		default:
		}
		if !f(i) {
			return
		}
	}
}
