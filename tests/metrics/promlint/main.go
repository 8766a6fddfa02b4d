// Command promlint reads a Prometheus text exposition on stdin and prints the problems that
// client_golang's promlint (the linter `promtool check metrics` runs) finds in it, one per line
// as "metric: text". Exit status: 0 clean, 1 problems found, 2 the exposition did not parse.
//
// tests/metrics/test_promlint.py builds it (outside the work tree, keyed by go.sum) and feeds
// it the operator's registry with every series populated.
package main

import (
	"fmt"
	"os"

	"github.com/prometheus/client_golang/prometheus/testutil/promlint"
)

func main() {
	problems, err := promlint.New(os.Stdin).Lint()
	if err != nil {
		fmt.Fprintf(os.Stderr, "promlint: %v\n", err)
		os.Exit(2)
	}
	for _, p := range problems {
		fmt.Printf("%s: %s\n", p.Metric, p.Text)
	}
	if len(problems) > 0 {
		os.Exit(1)
	}
}
