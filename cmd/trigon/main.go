// Command trigon serves and runs open-weight LLMs: `trigon run` generates
// from a prompt, `trigon serve` exposes an OpenAI-compatible HTTP API,
// `trigon inspect` describes a model file, `trigon convert` writes GGUF.
//
// This package only wires flags to the packages that do the work.
package main

import (
	"fmt"
	"os"

	"github.com/spf13/cobra"
)

func main() {
	if err := newRoot().Execute(); err != nil {
		fmt.Fprintln(os.Stderr, "trigon:", err)
		os.Exit(1)
	}
}

func newRoot() *cobra.Command {
	root := &cobra.Command{
		Use:           "trigon",
		Short:         "trigon: an LLM inference engine and server",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.AddCommand(runCmd(), serveCmd(), inspectCmd(), convertCmd(), evalCmd(), kernelsCmd(), benchCmd(), versionCmd())
	return root
}
