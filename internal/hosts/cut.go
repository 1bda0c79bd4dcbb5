package hosts

import (
	"fmt"
	"strings"
)

// Partitions are nftables rules in the hosts' own namespaces: table inet
// shardvisor_cut drops every packet to or from an address in its set
// "peers", on input and output alike (no exception for established
// connections: a cut host's open sessions stall as they would behind a
// failed switch; nothing is refused or reset).

const cutTable = "shardvisor_cut"

// ensureCutTable creates h's table once (a second `nft -f` of it would
// add its rules again).
func (h *Host) ensureCutTable() error {
	h.cutMu.Lock()
	defer h.cutMu.Unlock()
	if h.cutReady {
		return nil
	}
	script := fmt.Sprintf(`table inet %[1]s {
	set peers { type ipv4_addr; }
	chain in { type filter hook input priority 0; policy accept; ip saddr @peers drop; }
	chain out { type filter hook output priority 0; policy accept; ip daddr @peers drop; }
}
`, cutTable)
	if err := runIn(h.ns, script, "nft", "-f", "-"); err != nil {
		return err
	}
	h.cutReady = true
	return nil
}

// Cut drops every packet between a and each of others, both ways, until
// Heal.
func Cut(a *Host, others ...*Host) error {
	return setCut(a, others, "add")
}

// Heal undoes Cut between a and each of others.
func Heal(a *Host, others ...*Host) error {
	return setCut(a, others, "delete")
}

func setCut(a *Host, others []*Host, verb string) error {
	for _, b := range others {
		for _, p := range [2][2]*Host{{a, b}, {b, a}} {
			if err := p[0].ensureCutTable(); err != nil {
				return err
			}
			err := runIn(p[0].ns, "", "nft", verb, "element", "inet", cutTable, "peers", "{ "+p[1].Addr+" }")
			// Healing what was not cut is fine.
			if err != nil && !(verb == "delete" && strings.Contains(err.Error(), "No such file")) {
				return fmt.Errorf("hosts: %s %s<->%s: %w", map[string]string{"add": "cut", "delete": "heal"}[verb], a.Name, b.Name, err)
			}
		}
	}
	return nil
}

// Cuts lists the addresses h drops (for a test's log).
func (h *Host) Cuts() string {
	out, err := outputIn(h.ns, "nft", "list", "set", "inet", cutTable, "peers")
	if err != nil {
		return ""
	}
	return strings.TrimSpace(out)
}
