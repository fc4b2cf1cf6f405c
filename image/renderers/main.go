// Setpoint's renderers in one binary, as busybox does: called as `kustomize`
// it is kustomize's `build` and `version` commands (kustomize's own, without
// the editing ones and, as kubectl kustomize, without the flags that enable
// KRM functions), under any other name helm's command line. Helm already
// links kustomize's API (through Kubernetes' cli-runtime), so the two cost
// one Go runtime and one copy of the Kubernetes libraries: under 1 MiB more
// than helm alone, where a kustomize binary beside it is 15 MiB.
// image/renderers/build.sh builds it at the versions the tests use.
package main

import (
	"errors"
	"log/slog"
	"os"
	"path/filepath"

	"github.com/spf13/cobra"
	helmcmd "helm.sh/helm/v4/pkg/cmd"
	"helm.sh/helm/v4/pkg/kube"
	"sigs.k8s.io/kustomize/api/konfig"
	"sigs.k8s.io/kustomize/kustomize/v5/commands/build"
	"sigs.k8s.io/kustomize/kustomize/v5/commands/version"
	"sigs.k8s.io/kustomize/kyaml/filesys"
)

func main() {
	if filepath.Base(os.Args[0]) == "kustomize" {
		if err := kustomize().Execute(); err != nil {
			os.Exit(1)
		}
		return
	}
	// As helm's own main (cmd/helm): its field manager, its exit codes.
	// Setpoint runs `helm template` without a cluster, so client-go's auth
	// plugins are left out.
	kube.ManagedFieldsManager = "helm"
	cmd, err := helmcmd.NewRootCmd(os.Stdout, os.Args[1:], helmcmd.SetupLogging)
	if err != nil {
		slog.Warn("command failed", slog.Any("error", err))
		os.Exit(1)
	}
	if err := cmd.Execute(); err != nil {
		if cerr, ok := errors.AsType[helmcmd.CommandError](err); ok {
			os.Exit(cerr.ExitCode)
		}
		os.Exit(1)
	}
}

// kustomize's root command with only what Setpoint runs.
func kustomize() *cobra.Command {
	root := &cobra.Command{
		Use:   konfig.ProgramName,
		Short: "Builds kustomizations (kustomize's build and version commands)",
	}
	root.AddCommand(
		build.NewCmdBuild(filesys.MakeFsOnDisk(), build.MakeHelp(konfig.ProgramName, "build"), os.Stdout),
		version.NewCmdVersion(os.Stdout),
	)
	return root
}
