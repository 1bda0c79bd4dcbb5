package topo

// RouterMemberVersion is the newest router member record format.
const RouterMemberVersion = 1

// RouterMember is a router's ephemeral record at Paths.Router(id): which
// map version it has applied, so that a move can wait until every live
// router has seen the map that pauses a bucket.
type RouterMember struct {
	Version    int    `json:"version"`
	ID         string `json:"id"`
	Host       string `json:"host"`
	PID        int    `json:"pid"`
	Addr       string `json:"addr,omitempty"`
	MapVersion uint64 `json:"map_version"`
	StartedAt  string `json:"started_at"`
	AppliedAt  string `json:"applied_at,omitempty"`
}

// DecodeRouterMember decodes a router member record.
func DecodeRouterMember(path string, data []byte) (*RouterMember, error) {
	return decodeAs[RouterMember]("router member", path, data, RouterMemberVersion, nil)
}
