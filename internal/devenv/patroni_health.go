package devenv

import (
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"
)

// A group's health from its members' Patroni REST APIs: which member is
// primary, whether every other member streams from it and one of them
// synchronously (as Patroni's sync record says, not only PostgreSQL).

// member is one member of a group as its health check sees it.
type member struct {
	m                 int
	name, label       string // "pg4-m1", "pg4.m1"
	addr              string
	pgPort            int
	api               apiEndpoint
	pgPid, patroniPid int
}

func (e *Env) members(i int) ([]member, error) {
	n, _, err := e.recordedMembers(i)
	if err != nil {
		return nil, err
	}
	ms := make([]member, n)
	for m := 1; m <= n; m++ {
		ms[m-1] = member{m: m, name: MemberName(i, m), label: fmt.Sprintf("pg%d.m%d", i, m),
			addr: e.addr(MemberName(i, m)), pgPort: e.MemberPort(i, m), api: apiEndpoint{e.addr(MemberName(i, m)), e.MemberAPIPort(i, m), e.patroniAPI()},
			pgPid: e.memberPGPid(i, m), patroniPid: e.memberPatroniPid(i, m)}
	}
	return ms, nil
}

// apiAnswer is a REST API reply: code 0 when none came.
type apiAnswer struct {
	code int
	body map[string]any
}

// get asks a member's REST API; GET / answers 200 only on the leader,
// with the member's status: role, state, xlog, timeline, replication.
func (a apiEndpoint) get(path string) apiAnswer {
	if a.c == nil {
		return apiAnswer{} // no client: nobody answers
	}
	req, err := a.c.request(http.MethodGet, a.addr, a.port, path, nil)
	if err != nil {
		return apiAnswer{}
	}
	resp, err := a.c.client.Do(req)
	if err != nil {
		return apiAnswer{}
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var j map[string]any
	if json.Unmarshal(b, &j) != nil || j == nil {
		j = map[string]any{}
	}
	return apiAnswer{resp.StatusCode, j}
}

// probe asks every member at once.
func probe(ms []member) []apiAnswer {
	res := make([]apiAnswer, len(ms))
	var wg sync.WaitGroup
	for k := range ms {
		wg.Add(1)
		go func() { defer wg.Done(); res[k] = ms[k].api.get("/") }()
	}
	wg.Wait()
	return res
}

func str(j map[string]any, k string) string {
	if v, ok := j[k]; ok && v != nil {
		if s, ok := v.(string); ok {
			return s
		}
		return fmt.Sprint(v)
	}
	return ""
}

func orQ(s string) string {
	if s == "" {
		return "?"
	}
	return s
}

func obj(j map[string]any, k string) map[string]any {
	o, _ := j[k].(map[string]any)
	if o == nil {
		o = map[string]any{}
	}
	return o
}

func num(j map[string]any, k string) (int64, bool) {
	f, ok := j[k].(float64)
	return int64(f), ok
}

func tcpOK(addr string, port int) bool {
	c, err := net.DialTimeout("tcp", net.JoinHostPort(addr, strconv.Itoa(port)), time.Second)
	if err != nil {
		return false
	}
	c.Close()
	return true
}

// assessment is a group's health: a text per member, the problems, the
// leader (-1 if none or several).
type assessment struct {
	texts    []string
	problems []string
	lead     int
}

func assess(group string, ms []member, res []apiAnswer) assessment {
	a := assessment{texts: make([]string, len(ms)), lead: -1}
	var leaders []int
	for k, r := range res {
		if r.code == 200 {
			leaders = append(leaders, k)
		}
	}
	if len(leaders) == 1 {
		a.lead = leaders[0]
	}
	if len(leaders) > 1 {
		var ls []string
		for _, k := range leaders {
			ls = append(ls, ms[k].label)
		}
		a.problems = append(a.problems, fmt.Sprintf("%d members answer as primary: %s", len(leaders), strings.Join(ls, " ")))
	}
	repl := map[string]map[string]any{}
	var leadLSN int64
	haveLSN := false
	dcsSync := map[string]bool{}
	if a.lead >= 0 {
		lj := res[a.lead].body
		if rs, ok := lj["replication"].([]any); ok {
			for _, r := range rs {
				if r, ok := r.(map[string]any); ok {
					repl[str(r, "application_name")] = r
				}
			}
		}
		leadLSN, haveLSN = num(obj(lj, "xlog"), "location")
		// Synchronous for failover only once Patroni's sync record names
		// the standby (its /cluster role sync_standby): PostgreSQL says
		// "sync" a loop earlier, and until then Patroni promotes nobody
		// ("not the healthiest node").
		if ms, ok := ms[a.lead].api.get("/cluster").body["members"].([]any); ok {
			for _, c := range ms {
				if c, ok := c.(map[string]any); ok && str(c, "role") == "sync_standby" {
					dcsSync[str(c, "name")] = true
				}
			}
		}
	}
	sync := 0
	for k, m := range ms {
		code, j := res[k].code, res[k].body
		var t string
		switch {
		case m.patroniPid == 0:
			t = "patroni not running"
			if m.pgPid != 0 {
				t += fmt.Sprintf(" (postgres pid %d still runs)", m.pgPid)
			} else {
				t = "stopped"
			}
			a.problems = append(a.problems, m.label+": "+t)
		case code == 0:
			t = fmt.Sprintf("Patroni not answering on its REST API (port %d)", m.api.port)
			a.problems = append(a.problems, m.label+": "+t)
		case k == a.lead:
			t = fmt.Sprintf("primary %s timeline %s", orQ(str(j, "state")), orQ(str(j, "timeline")))
			if str(j, "state") != "running" || !tcpOK(m.addr, m.pgPort) {
				a.problems = append(a.problems, m.label+": primary not accepting connections")
			}
		default:
			role, state := str(j, "role"), str(j, "state")
			r := repl[m.name]
			if role == "replica" && state == "running" && r != nil && str(r, "state") == "streaming" {
				lag := "?"
				if haveLSN {
					replayed, _ := num(obj(j, "xlog"), "replayed_location")
					lag = strconv.FormatInt(max(0, leadLSN-replayed), 10)
				}
				kind := "async"
				if str(r, "sync_state") == "sync" {
					kind = "sync in PostgreSQL, not yet in Patroni's sync record"
					if dcsSync[m.name] {
						kind = "sync"
					}
				}
				if kind == "sync" {
					sync++
				}
				t = fmt.Sprintf("replica streaming (%s) lag %s", kind, lag)
			} else {
				t = orQ(role) + " " + orQ(state)
				if role == "replica" && state == "running" {
					t += ", not streaming"
					if a.lead < 0 {
						t += " (no leader)"
					}
				}
				a.problems = append(a.problems, m.label+": "+t)
			}
		}
		a.texts[k] = t
	}
	if len(leaders) == 0 {
		a.problems = append(a.problems, group+": no leader (primary)")
	} else if a.lead >= 0 && len(ms) > 1 && sync == 0 && len(a.problems) == 0 {
		// Only a group in synchronous mode needs one (bench/failover runs
		// asynchronous groups too).
		cfg := ms[a.lead].api.get("/config").body
		if v, ok := cfg["synchronous_mode"]; !ok || v != false {
			a.problems = append(a.problems, group+": no synchronous standby yet")
		}
	}
	return a
}

// groupHealth assesses group i now.
func (e *Env) groupHealth(i int) ([]member, assessment, error) {
	ms, err := e.members(i)
	if err != nil {
		return nil, assessment{}, err
	}
	return ms, assess("pg"+strconv.Itoa(i), ms, probe(ms)), nil
}

// groupStatus writes one line per member, then the problems no member
// line shows; healthy is false if there are problems.
func (e *Env) groupStatus(w io.Writer, i int) (healthy bool) {
	ms, a, err := e.groupHealth(i)
	if err != nil {
		fmt.Fprintln(w, err)
		return false
	}
	for k, m := range ms {
		pid := "-"
		if m.pgPid != 0 {
			pid = strconv.Itoa(m.pgPid)
		}
		fmt.Fprintf(w, "%-11s %-6d %-8s %s\n", m.label, m.pgPort, pid, a.texts[k])
	}
	for _, p := range a.problems {
		own := false
		for _, m := range ms {
			own = own || strings.HasPrefix(p, m.label+":")
		}
		if !own {
			fmt.Fprintln(w, p)
		}
	}
	return len(a.problems) == 0
}

// Primary is group i's current primary member ("pg4-m2") and its port, as
// its REST API says; ok is false if no member is primary right now.
func (e *Env) Primary(i int) (name string, port int, ok bool, err error) {
	if !e.IsGroup(i) {
		return "", 0, false, fmt.Errorf("pg%d is not a Patroni group", i)
	}
	ms, err := e.members(i)
	if err != nil {
		return "", 0, false, err
	}
	for k, r := range probe(ms) {
		if r.code == 200 {
			return ms[k].name, ms[k].pgPort, true, nil
		}
	}
	return "", 0, false, nil
}

// groupWait waits until group i has a primary accepting connections and
// every other member streams from it, one synchronously.
func (e *Env) groupWait(i int, deadline time.Time) error {
	start := time.Now()
	nudged := start
	for {
		ms, a, err := e.groupHealth(i)
		if err != nil {
			return err
		}
		if len(a.problems) == 0 {
			e.logf("pg%d: healthy after waiting %.1fs", i, time.Since(start).Seconds())
			return nil
		}
		if time.Since(nudged) >= staleRewindAfter {
			nudged = time.Now()
			e.nudgeStaleRewind(i, ms)
		}
		// A Patroni that is gone 10 s after the start will not come back.
		dead := false
		for _, m := range ms {
			dead = dead || m.patroniPid == 0
		}
		if time.Now().After(deadline) || (dead && time.Since(start) >= 10*time.Second) {
			var logs []string
			for _, m := range ms {
				logs = append(logs, e.MemberDir(i, m.m)+"/patroni.log", e.MemberDir(i, m.m)+"/postgres.log")
			}
			return withLogs(fmt.Errorf("pg%d not healthy after %ds:\n  %s", i, int(time.Since(start).Seconds()), strings.Join(a.problems, "\n  ")), logs...)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// groupStreamUser creates StreamUser on group i's primary (its standbys
// get it by replication), over the primary's unix socket.
func (e *Env) groupStreamUser(i int) error {
	_, port, ok, err := e.Primary(i)
	if err != nil {
		return err
	}
	if !ok {
		return fmt.Errorf("no primary to create %s on", StreamUser)
	}
	n, err := e.Members(i)
	if err != nil {
		return err
	}
	for m := 1; m <= n; m++ {
		if e.MemberPort(i, m) == port {
			return ensureStreamUser(e.MemberDir(i, m), port)
		}
	}
	return fmt.Errorf("the primary's port %d is no member's", port)
}
