// Command shardctl is shardvisor's admin CLI. It only parses flags and
// calls the packages that do the work: commands.go declares the command
// line, and each topic's file holds its commands' Actions.
package main

import "github.com/shardvisor/shardvisor/internal/cliutil"

func main() {
	cliutil.Run(newApp())
}
