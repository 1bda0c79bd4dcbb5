package zksession

import "github.com/go-zookeeper/zk"

// Conn is the small connection interface a Session runs on: ZooKeeper's
// operations with ZooKeeper's semantics (znode versions for compare-and-swap,
// ephemeral nodes owned by a session, one-shot watches, atomic multi).
// *zk.Conn is the production implementation; package memzk holds an
// in-memory one, so that everything above the connection (states, watches,
// locks, ephemerals, every topo record) runs in tests without servers.
//
// A Conn is expected to queue or block calls while it is disconnected, as
// go-zookeeper does; the Session bounds every call with its own timeout.
type Conn interface {
	Get(path string) ([]byte, *zk.Stat, error)
	GetW(path string) ([]byte, *zk.Stat, <-chan zk.Event, error)
	Exists(path string) (bool, *zk.Stat, error)
	ExistsW(path string) (bool, *zk.Stat, <-chan zk.Event, error)
	Children(path string) ([]string, *zk.Stat, error)
	ChildrenW(path string) ([]string, *zk.Stat, <-chan zk.Event, error)
	Create(path string, data []byte, flags int32, acl []zk.ACL) (string, error)
	Set(path string, data []byte, version int32) (*zk.Stat, error)
	Delete(path string, version int32) error
	// Multi takes *zk.CheckVersionRequest, *zk.CreateRequest,
	// *zk.SetDataRequest and *zk.DeleteRequest.
	Multi(ops ...any) ([]zk.MultiResponse, error)
	Sync(path string) (string, error)
	GetACL(path string) ([]zk.ACL, *zk.Stat, error)
	SetACL(path string, acl []zk.ACL, version int32) (*zk.Stat, error)
	AddAuth(scheme string, auth []byte) error
	SessionID() int64
	Server() string
	Close()
}

var _ Conn = (*zk.Conn)(nil)
