package cli

import (
	"errors"
	"os"
	"runtime/debug"

	"github.com/spf13/cobra"

	"github.com/kubefence/kubefence/proxy"
)

func newProxyCommand(g *globals) *cobra.Command {
	o := proxy.NewOptions()
	cmd := &cobra.Command{
		Use:   "proxy",
		Short: "Run the fencing reverse proxy in front of kube-apiserver",
		Long: `Run the fencing reverse proxy. It stands where the API load balancer stood and forwards
to one kube-apiserver (--upstream). 'kubefence fence on' makes it refuse writes with 429 +
Retry-After while reads and watches flow; 'kubefence backend set' switches it to another
apiserver while fenced; 'kubefence fence off' reopens writes. The fence state and backend are
kept in --state-file, so a restarted proxy resumes them.`,
		Args: args(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if errs := o.Validate(); len(errs) > 0 {
				return usage(errors.Join(errs...))
			}
			cfg, err := o.Complete()
			if err != nil {
				return usage(err)
			}
			if os.Getenv("GOGC") == "" {
				// A proxy's live heap is small and its garbage rate high (net/http allocates
				// ~14 KB per forwarded request): collecting at 4x the live heap instead of 2x
				// took single-round make bench-proxy runs from 14.8k to 15.7-16.7k req/s, for a
				// few tens of MB. GOGC in the environment overrides.
				debug.SetGCPercent(400)
			}
			s, err := proxy.New(cfg, g.logger())
			if err != nil {
				return err
			}
			return s.Run(cmd.Context())
		},
	}
	o.AddFlags(cmd.Flags())
	return cmd
}
