package testkit

// WorkerReply is the supervisor tests' worker's answer to every request
// (internal/testworker writes it, the tests read it): who answered, and
// what the supervisor gave it.
type WorkerReply struct {
	PID        int      `json:"pid"`
	Gen        string   `json:"gen"`
	Tag        string   `json:"tag"`
	MapVersion string   `json:"map_version"`
	MapFile    string   `json:"map_file"`
	Map        string   `json:"map"`
	FDNames    []string `json:"fd_names"`
}
