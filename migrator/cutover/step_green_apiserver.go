package cutover

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/kubefence/kubefence/internal/atomicfile"
)

// greenAPIServerStep starts green's kube-apiserver, as a process kubefence starts or as a
// static pod the kubelet runs, and waits for its /readyz.
type greenAPIServerStep struct{}

func (greenAPIServerStep) name() string                  { return StepGreenAPIServer }
func (greenAPIServerStep) timeout(p *Plan) time.Duration { return p.Timeouts.GreenAPIServer.D() }
func (greenAPIServerStep) pastNoReturn() bool            { return false }

func (greenAPIServerStep) describe(r *runner, verbose bool) string {
	var parts []string
	for _, a := range r.p.greenAPIServers() {
		switch sp := a.StaticPod; {
		case sp != nil:
			parts = append(parts, fmt.Sprintf("write %s into %s, wait for %s/readyz", sp.Manifest, sp.ManifestDir, a.URL))
		case len(a.Command) > 0:
			cmd := filepath.Base(a.Command[0])
			if verbose {
				cmd = strings.Join(a.Command, " ")
			}
			parts = append(parts, fmt.Sprintf("start %s, wait for %s/readyz", cmd, a.URL))
		default:
			parts = append(parts, fmt.Sprintf("wait for %s/readyz (its host starts it)", a.URL))
		}
	}
	return strings.Join(parts, "; ")
}

func (greenAPIServerStep) run(ctx context.Context, r *runner) (string, error) {
	// Green etcd exiting meanwhile is why the apiserver cannot get ready: said at once.
	watch := r.greenEtcdProcesses()
	if r.p.Green.APIServer.StaticPod != nil {
		if err := r.placeGreenManifest(); err != nil {
			return "", err
		}
	}
	for _, gp := range r.p.greenAPIServerProcesses() {
		if err := r.startGreenProcess(ctx, gp.greenProcess, gp.url); err != nil {
			return "", err
		}
		watch = append(watch, gp.greenProcess)
	}
	start := time.Now()
	var ready []string
	for _, a := range r.p.greenAPIServers() {
		err := r.pollGreen(ctx, 200*time.Millisecond, "green apiserver "+a.URL+" not ready", func(ctx context.Context) error {
			return readyz(ctx, a.Kubeconfig)
		}, watch...)
		if err != nil {
			return "", err
		}
		ready = append(ready, fmt.Sprintf("%s ready after %s", a.URL, time.Since(start).Round(10*time.Millisecond)))
	}
	return strings.Join(ready, ", "), nil
}

// greenAPIServerProc is a green apiserver kubefence starts, and its URL.
type greenAPIServerProc struct {
	greenProcess
	url string
}

// greenAPIServerProcesses are the green apiservers kubefence starts as processes: green.apiserver
// unless it is a static pod, and those of green.apiservers with a command.
// greenAPIServerPIDName says whether name is one the journal keeps a green apiserver's pid by
// ("apiserver", "apiservers-N"), which etcd members share a map with.
func greenAPIServerPIDName(name string) bool {
	if name == "apiserver" {
		return true
	}
	n, ok := strings.CutPrefix(name, "apiservers-")
	_, err := strconv.Atoi(n)
	return ok && err == nil
}

// checkMemberNames refuses (at the preflight: a plan already under way must still be read by
// abort and cleanup) a green etcd member named as the journal names a green apiserver's
// process: its pid would be taken for the apiserver's, and an abort or cleanup would leave that
// etcd running and remove its data dir under it.
func checkMemberNames(p *Plan) error {
	var errs []error
	for i, m := range p.Green.Etcd.Members {
		if greenAPIServerPIDName(m.Name) {
			errs = append(errs, fmt.Errorf("green.etcd.members[%d].name %q is what the journal names a green apiserver's process by: give the member another name", i, m.Name))
		}
	}
	return errors.Join(errs...)
}

func (p *Plan) greenAPIServerProcesses() []greenAPIServerProc {
	var out []greenAPIServerProc
	for i, a := range p.greenAPIServers() {
		if len(a.Command) == 0 {
			continue
		}
		gp := greenProcess{name: "apiserver", what: "green apiserver", log: "green-apiserver", argv: a.Command}
		if i > 0 { // green.apiservers[i-1]
			gp.name, gp.what, gp.log = fmt.Sprintf("apiservers-%d", i-1), "green apiserver "+a.URL, fmt.Sprintf("green-apiservers-%d", i-1)
		}
		out = append(out, greenAPIServerProc{gp, a.URL})
	}
	return out
}

// placeGreenManifest writes the green apiserver's manifest into the kubelet's directory. A file
// of that name the cutover did not place, or a manifest there with the same pod namespace/name,
// is refused again (the preflight checked both: it is a pod the kubelet runs), and the
// placement is journaled first, so that abort removes only what the cutover placed.
func (r *runner) placeGreenManifest() error {
	sp := r.p.Green.APIServer.StaticPod
	path := staticPodPath(sp)
	if r.j.StaticPodPlaced != path {
		if err := manifestAbsent(sp); err != nil {
			return err
		}
		if err := manifestNameFree(sp); err != nil {
			return err
		}
		r.j.StaticPodPlaced = path
		if err := r.saveJournal(); err != nil {
			return err
		}
	}
	return placeStaticPod(sp)
}

// manifestAbsent refuses a green manifest whose file name is already in the kubelet's directory.
func manifestAbsent(sp *StaticPod) error {
	path := staticPodPath(sp)
	if _, err := os.Lstat(path); err == nil {
		return fmt.Errorf("green.apiserver.staticPod: %s already exists in the kubelet's manifest dir: the cutover would replace a pod the kubelet runs; give green's manifest a file name of its own", path)
	} else if !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("green.apiserver.staticPod: %w", err)
	}
	return nil
}

// staticPodPath is where the green apiserver's manifest goes in the kubelet's directory.
func staticPodPath(sp *StaticPod) string {
	return filepath.Join(sp.ManifestDir, filepath.Base(sp.Manifest))
}

// placeStaticPod copies the manifest into the kubelet's directory atomically.
func placeStaticPod(sp *StaticPod) error {
	data, err := os.ReadFile(sp.Manifest)
	if err != nil {
		return err
	}
	return atomicfile.Write(staticPodPath(sp), data, 0o600)
}
