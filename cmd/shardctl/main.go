// Command shardctl is shardvisor's admin CLI. It only parses flags and
// calls the packages that do the work.
package main

import (
	"github.com/urfave/cli/v2"

	"github.com/shardvisor/shardvisor/internal/cliutil"
)

func main() {
	cliutil.Run(newApp())
}

func newApp() *cli.App {
	return &cli.App{
		Name:  "shardctl",
		Usage: "administer a shardvisor cluster: bucket map, db nodes, pools, moves",
		Description: "Every command reads --zk, --zk-root and --cluster (or SHARDVISOR_ZK, SHARDVISOR_ZK_ROOT, SHARDVISOR_CLUSTER).\n" +
			"Output is text for people; --json prints JSON for scripts. Exit status: 0 ok, 1 failure, 2 usage error.",
		Flags: append(cliutil.ZKFlags(), cliutil.OutputFlags("warn")...),
		Commands: []*cli.Command{
			initCommand(), statusCommand(), nodeCommand(), tableCommand(), splitCommand(), planCommand(), assignCommand(),
			simulateCommand(), moveCommand(), movesCommand(), rebalanceCommand(), gcCommand(), poolCommand(),
			routeCommand(), hashCommand(), zkCommand(),
		},
		EnableBashCompletion: true,
	}
}
