package fleet

import (
	"fmt"
	"slices"
	"strings"
	"time"
)

// A member record that was seen and then vanished is not proof that nobody
// is there: another identity may have deleted it under its owner's live
// session (the owner's zksession.Ephemeral puts it back within a round
// trip, but a reader may read in the gap), and a member cut off from
// ZooKeeper may still serve from its last map until its session is shown
// ended. Only the session's end frees it, and a reader cannot ask
// ZooKeeper whether another session is alive; it waits instead: a live
// owner re-creates its record well within one session timeout, and a
// session that could not has expired by then. So a vanished member counts,
// as not having applied anything newer than its record's last map version,
// until its record reappears or the reader's own session timeout (the
// grace) has passed since the reader found it gone. A clean exit looks the
// same from outside, and is counted the same bounded time.

// Seen is what a reader knows of one member record it has read.
type Seen struct {
	MapVersion uint64    // the last version its record said (0 if it did not decode)
	LastSeen   time.Time // when it was last known to be there
	GoneAt     time.Time // when the reader found it gone; zero while it is there
}

// Gone says that a member's record was seen and then vanished: the member
// still counts, at the last map version its record said.
type Gone struct {
	Ago      time.Duration // since the reader found it gone
	LastSeen time.Duration // since it was last known to be there (a polling reader's gap)
	Grace    time.Duration // the longest a vanished record counts
}

func (g *Gone) String() string {
	seen := ""
	if g.LastSeen > g.Ago {
		// A reader that polls (GC) knows only that it vanished since.
		seen = fmt.Sprintf(" (last seen %s ago)", roundAgo(g.LastSeen))
	}
	return fmt.Sprintf("record vanished %s ago%s; counted until its session is shown ended (at most %s)", roundAgo(g.Ago), seen, g.Grace)
}

func roundAgo(d time.Duration) time.Duration {
	if d < time.Second {
		return d.Round(time.Millisecond)
	}
	return d.Round(100 * time.Millisecond)
}

// Vanished is the one decision on a member whose record was seen and is
// gone (s.GoneAt set): at now, with the reader's grace, it still counts
// (ok), as a at its last map version, or it is shown gone. A record found
// gone at the same moment it was last seen by a watching reader counts the
// full grace; the deadline is s.GoneAt plus grace.
func Vanished(at string, s Seen, now time.Time, grace time.Duration) (a Applied, ok bool) {
	if s.GoneAt.IsZero() || !now.Before(s.GoneAt.Add(grace)) {
		return Applied{}, false
	}
	return Applied{Path: at, MapVersion: s.MapVersion, Gone: &Gone{Ago: now.Sub(s.GoneAt), LastSeen: now.Sub(s.LastSeen), Grace: grace}}, true
}

// Remembered is what a reader that reads the members now and then (GC,
// once a pass) keeps between reads, so that a record it saw and then
// misses counts as Vanished says. The zero value remembers nothing yet; a
// reader with no earlier read (a one-shot GC run) cannot know what
// vanished. Not safe for concurrent use.
type Remembered struct {
	seen map[string]Seen
}

// Pass takes a read of the live member records made at now, remembers it,
// and returns the members that count: those read, then those an earlier
// pass saw that have been gone for less than grace (a member first missed
// now is taken to have vanished now: it may have gone any time since it
// was last seen, and the later start is the cautious one). Members gone
// longer are forgotten.
func (r *Remembered) Pass(read []Applied, now time.Time, grace time.Duration) []Applied {
	if r.seen == nil {
		r.seen = map[string]Seen{}
	}
	out := append([]Applied(nil), read...)
	var gone []Applied
	there := make(map[string]bool, len(read))
	for _, m := range read {
		there[m.Path] = true
		r.seen[m.Path] = Seen{MapVersion: m.MapVersion, LastSeen: now}
	}
	for at, s := range r.seen {
		if there[at] {
			continue
		}
		if s.GoneAt.IsZero() {
			s.GoneAt = now
			r.seen[at] = s
		}
		a, ok := Vanished(at, s, now, grace)
		if !ok {
			delete(r.seen, at)
			continue
		}
		gone = append(gone, a)
	}
	slices.SortFunc(gone, func(a, b Applied) int { return strings.Compare(a.Path, b.Path) })
	return append(out, gone...)
}
