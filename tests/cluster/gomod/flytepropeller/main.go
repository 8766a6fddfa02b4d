// Flyte's propeller alone, from Go modules only: flytepropeller's cmd/controller with the plugins
// the tests need (container/sidecar pods, k8s arrays, echo) and without the spark plugin, whose
// operator module the proxy does not serve. The connector plugin needs no import: the task handler
// registers it itself. kubectl-flyte is built from this module too (build.sh flytepropeller).
package main

import (
	"github.com/flyteorg/flyte/flytepropeller/cmd/controller/cmd"

	_ "github.com/flyteorg/flyte/flyteplugins/go/tasks/plugins/array/k8s"
	_ "github.com/flyteorg/flyte/flyteplugins/go/tasks/plugins/k8s/pod"
	_ "github.com/flyteorg/flyte/flyteplugins/go/tasks/plugins/testing"
)

func main() {
	cmd.Execute()
}
