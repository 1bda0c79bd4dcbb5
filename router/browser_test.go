package router

import (
	"context"
	"fmt"
	"image/png"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/shardvisor/shardvisor/bucketmap"
)

func chromium(t *testing.T) string {
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	if os.Getenv("CI") == "true" {
		t.Fatal("chromium is required under CI (scripts/install-deps installs it)")
	}
	t.Skip("chromium not installed (apt-get install chromium)")
	return ""
}

// headless runs chromium on url with extra flags and returns its stdout.
func headless(t *testing.T, bin, url string, extra ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	args := append([]string{"--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
		"--disable-background-networking", "--disable-component-update", "--disable-sync", "--hide-scrollbars",
		"--user-data-dir=" + t.TempDir(), "--window-size=1280,900", "--virtual-time-budget=4000"}, extra...)
	cmd := exec.CommandContext(ctx, bin, append(args, url)...)
	cmd.WaitDelay = 5 * time.Second
	var out, errb strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		t.Fatalf("chromium %v: %v\n%s", extra, err, errb.String())
	}
	return out.String()
}

// The status page renders a grid of buckets coloured by owner in a real
// browser: every node's colour is on screen, in proportion to its buckets.
func TestStatusPageRendersInBrowser(t *testing.T) {
	bin := chromium(t)
	m, _ := bucketmap.New(6, testNodes(4), t0) // 64 buckets, 16 each
	m = next(m)
	if err := m.SetMoving(0, "pg4", "mv-0"); err != nil {
		t.Fatal(err)
	}
	r := fileRouter(t, m)
	srv := httptest.NewServer(Handler(r, HandlerOptions{}))
	defer srv.Close()

	dom := headless(t, bin, srv.URL+"/", "--dump-dom")
	if n := strings.Count(dom, `class="cell`); n != 64 {
		t.Fatalf("%d grid cells in the rendered page, want 64", n)
	}
	if !strings.Contains(dom, `class="cell moving"`) || !strings.Contains(dom, "bucket 0: pg1 → pg4") {
		t.Fatal("the moving bucket is not highlighted")
	}
	for _, want := range []string{">c1<", ">2<", "pg1", "pg4", "balanced"} {
		if !strings.Contains(dom, want) {
			t.Fatalf("rendered page lacks %q", want)
		}
	}

	shot := filepath.Join(t.TempDir(), "status.png")
	headless(t, bin, srv.URL+"/", "--screenshot="+shot)
	f, err := os.Open(shot)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	img, err := png.Decode(f)
	if err != nil {
		t.Fatal(err)
	}
	// The page's palette for owners 0..3.
	palette := []string{"4e79a7", "f28e2b", "e15759", "76b7b2"}
	counts := make([]int, len(palette))
	bounds := img.Bounds()
	for y := bounds.Min.Y; y < bounds.Max.Y; y++ {
		for x := bounds.Min.X; x < bounds.Max.X; x++ {
			r, g, b, _ := img.At(x, y).RGBA()
			hex := fmt.Sprintf("%02x%02x%02x", r>>8, g>>8, b>>8)
			for i, p := range palette {
				if hex == p {
					counts[i]++
				}
			}
		}
	}
	t.Logf("owner colour pixels: %v", counts)
	for i, c := range counts {
		if c < 1000 {
			t.Fatalf("owner %d's colour covers %d pixels; the grid did not render (%v)", i, c, counts)
		}
	}
	// 16 buckets each: no colour should dominate another by more than 2x.
	for i := range counts {
		for j := range counts {
			if counts[i] > 2*counts[j] {
				t.Fatalf("colour areas out of proportion to bucket counts: %v", counts)
			}
		}
	}
	if os.Getenv("SHARDVISOR_KEEP_SCREENSHOT") != "" {
		data, _ := os.ReadFile(shot)
		os.WriteFile(os.Getenv("SHARDVISOR_KEEP_SCREENSHOT"), data, 0o644)
	}
}
