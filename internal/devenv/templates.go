package devenv

import (
	"bytes"
	"embed"
	"path/filepath"
	"strings"
	"text/template"
)

// The servers' configuration files, rendered anew on every start. Their
// text is byte for byte what scripts/devenv wrote: up compares a running
// ZooKeeper's zoo.cfg and a member's patroni.yml with them to restart or
// reload what changed.
//
//go:embed templates/*.tmpl
var templateFS embed.FS

var templates = template.Must(template.New("").Option("missingkey=error").ParseFS(templateFS, "templates/*.tmpl"))

func render(name string, data any) []byte {
	var b bytes.Buffer
	if err := templates.ExecuteTemplate(&b, name+".tmpl", data); err != nil {
		panic("devenv: template " + name + ": " + err.Error()) // the templates are fixed: a bug
	}
	return b.Bytes()
}

type zkServer struct {
	ID, Quorum, Election int
	Addr                 string
}

// zooCfg is server i's zoo.cfg.
func (e *Env) zooCfg(i int) []byte {
	d := struct {
		Dir              string
		Port             int
		Servers          []zkServer
		TLS              bool
		KeyStore, CAFile string
		Addr             string
	}{Dir: e.ZKDir(i), Port: e.ZKPort(i), TLS: e.c.TLS, Addr: e.addr("zk" + itoa(i)),
		KeyStore: filepath.Join(e.TLSDir(), "zk"+itoa(i)+".pem"), CAFile: e.TLSFiles("").CA}
	for j := 1; j <= ZKServers; j++ {
		d.Servers = append(d.Servers, zkServer{j, e.zkQuorumPort(j), e.zkElectionPort(j), e.addr("zk" + itoa(j))})
	}
	return render("zoo.cfg", d)
}

func (e *Env) log4jProperties(i int) []byte {
	return render("log4j.properties", struct{ Dir string }{e.ZKDir(i)})
}

// shardvisorConf is plain node i's data/shardvisor.conf, which its
// postgresql.conf includes.
func (e *Env) shardvisorConf(i int) []byte {
	tf := e.TLSFiles("pg" + itoa(i))
	return render("shardvisor.conf", struct {
		Node, Port                     int
		Dir                            string
		TLS                            bool
		CA, Cert, Key, HBA             string
		Addr                           string
		ArchiveCommand, ArchiveTimeout string
	}{i, e.PGPort(i), e.PGDir(i), e.c.TLS, tf.CA, tf.Cert, tf.Key, e.pgHBATLSFile(i), e.addr("pg" + itoa(i)),
		e.archiveCommand(i, e.pgData(i)), ArchiveTimeout})
}

// patroniYML is member m's patroni.yml of group i. Its Patroni reaches
// ZooKeeper through the member's own forwarders (zklink.go), so that it
// can be cut off alone.
func (e *Env) patroniYML(i, m int, password, apiPassword string) []byte {
	hosts := ""
	for j := 1; j <= ZKServers; j++ {
		if j > 1 {
			hosts += ", "
		}
		if e.c.Hosts != nil {
			hosts += "'" + e.hostPort("zk"+itoa(j), e.ZKPort(j)) + "'"
		} else {
			hosts += "'127.0.0.1:" + itoa(e.ZKLinkPort(i, m, j)) + "'"
		}
	}
	tf := e.TLSFiles("patroni-pg" + itoa(i))
	pf := e.TLSFiles(MemberName(i, m))
	return render("patroni.yml", struct {
		Node, Port, APIPort                            int
		Name, Namespace, ZKHosts, Dir, PGBin, Password string
		TLS                                            bool
		CA, Cert, Key, Owner, APIUser, APIPassword     string
		PGCert, PGKey, HBACert, Ident                  string
		Readers                                        []string
		Addr, CIDR                                     string
		ArchiveCommand, ArchiveTimeout, StanzaCreate   string
	}{i, e.MemberPort(i, m), e.MemberAPIPort(i, m), MemberName(i, m), PatroniNamespace, hosts, e.MemberDir(i, m), pgBin, password,
		e.c.TLS, tf.CA, tf.Cert, tf.Key, patroniIdentity(i).DN(), PatroniAPIUser, apiPassword, pf.Cert, pf.Key, pgHBACertLine(e.clientCIDR()), pgIdentLine, patroniReaders(),
		e.addr(MemberName(i, m)), e.clientCIDR(), e.archiveCommand(i, filepath.Join(e.MemberDir(i, m), "data")), ArchiveTimeout,
		strings.Join(e.stanzaCreateArgs(i, "--log-level-console=error"), " ")})
}
