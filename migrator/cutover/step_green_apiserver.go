package cutover

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
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
	a := r.p.Green.APIServer
	if sp := a.StaticPod; sp != nil {
		return fmt.Sprintf("write %s into %s, wait for %s/readyz", sp.Manifest, sp.ManifestDir, a.URL)
	}
	cmd := filepath.Base(a.Command[0])
	if verbose {
		cmd = strings.Join(a.Command, " ")
	}
	return fmt.Sprintf("start %s, wait for %s/readyz", cmd, a.URL)
}

func (greenAPIServerStep) run(ctx context.Context, r *runner) (string, error) {
	a := r.p.Green.APIServer
	var watch []greenProcess
	if a.StaticPod != nil {
		if err := r.placeGreenManifest(); err != nil {
			return "", err
		}
	} else {
		gp := greenAPIServerProcess(a)
		if err := r.startGreenProcess(gp, a.URL); err != nil {
			return "", err
		}
		watch = append(watch, gp)
	}
	start := time.Now()
	err := r.pollGreen(ctx, 200*time.Millisecond, "green apiserver "+a.URL+" not ready", func(ctx context.Context) error {
		return readyz(ctx, a.Kubeconfig)
	}, watch...)
	if err != nil {
		return "", err
	}
	return fmt.Sprintf("%s ready after %s", a.URL, time.Since(start).Round(10*time.Millisecond)), nil
}

func greenAPIServerProcess(a GreenAPIServer) greenProcess {
	return greenProcess{name: "apiserver", what: "green apiserver", log: "green-apiserver", argv: a.Command}
}

// placeGreenManifest writes the green apiserver's manifest into the kubelet's directory. A file
// of that name the cutover did not place is refused (it is a pod the kubelet runs), and the
// placement is journaled first, so that abort removes only what the cutover placed.
func (r *runner) placeGreenManifest() error {
	sp := r.p.Green.APIServer.StaticPod
	path := staticPodPath(sp)
	if r.j.StaticPodPlaced != path {
		if err := manifestAbsent(sp); err != nil {
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
