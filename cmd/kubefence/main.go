// Command kubefence moves a Kubernetes control plane to a new storage backend with a fencing proxy.
package main

import (
	"os"

	"github.com/kubefence/kubefence/cmd/kubefence/cli"
)

func main() {
	os.Exit(cli.Main(os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
}
