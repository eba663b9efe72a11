package framework

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
)

// Leader election as kubeadm leaves it: the components' defaults, passed explicitly so that a
// test can reason about them.
const (
	LeaseDuration = 15 * time.Second
	RenewDeadline = 10 * time.Second
	RetryPeriod   = 2 * time.Second
)

// LeaderLost is what kube-controller-manager ("leaderelection lost/stopped") and kube-scheduler
// ("Leaderelection lost") log, matched without case, just before they exit when they could not
// renew their lease within the renew deadline; client-go's elector logs renewFailed first.
const (
	LeaderLost  = "leaderelection lost"
	renewFailed = "Failed to renew lease"
)

// ControlPlaneConfig describes a kube-controller-manager or kube-scheduler to start.
type ControlPlaneConfig struct {
	// Server is the URL the component talks to: the kubefence proxy, or an apiserver.
	Server  string
	PKI     *PKI
	Version string // Kube136 when empty
	// ExtraArgs are appended to the flags (a later flag wins).
	ExtraArgs []string
}

// ControlPlaneComponent is a running kube-controller-manager or kube-scheduler.
type ControlPlaneComponent struct {
	Name string // "kube-controller-manager" or "kube-scheduler"
	// Lease is the name of its leader-election Lease in kube-system.
	Lease string
	// Kubeconfig logs in as the component (kubeadm's controller-manager.conf / scheduler.conf).
	Kubeconfig string
	// HealthURL is the component's /healthz on its secure port.
	HealthURL string
	Proc      *Process
}

// StartControllerManager starts kube-controller-manager against cfg.Server as kubeadm does:
// client identity CN system:kube-controller-manager, kubeadm's controllers, per-controller
// ServiceAccount credentials, and leader election on.
func (e *Env) StartControllerManager(cfg ControlPlaneConfig) (*ControlPlaneComponent, error) {
	p := cfg.PKI
	return e.startControlPlane(cfg, "kube-controller-manager", "controller-manager", []string{
		"--root-ca-file=" + p.CACert,
		"--service-account-private-key-file=" + p.SAKey,
		"--cluster-signing-cert-file=" + p.CACert,
		"--cluster-signing-key-file=" + p.CAKey,
		"--service-cluster-ip-range=10.96.0.0/12",
		"--controllers=*,bootstrapsigner,tokencleaner",
		// Each controller uses its own ServiceAccount's token (bearer, passed through by the
		// proxy); system:kube-controller-manager itself may only run leader election and
		// mint those tokens.
		"--use-service-account-credentials=true",
	})
}

// StartScheduler starts kube-scheduler against cfg.Server with kubeadm's client identity
// (CN system:kube-scheduler) and leader election on.
func (e *Env) StartScheduler(cfg ControlPlaneConfig) (*ControlPlaneComponent, error) {
	return e.startControlPlane(cfg, "kube-scheduler", "scheduler", nil)
}

// startControlPlane issues the component's client certificate, writes its kubeconfig and
// starts it on a free loopback port with the flags kubeadm gives both components plus own.
func (e *Env) startControlPlane(cfg ControlPlaneConfig, name, short string, own []string) (*ControlPlaneComponent, error) {
	if cfg.Version == "" {
		cfg.Version = Kube136
	}
	bin, err := Bin(name, cfg.Version)
	if err != nil {
		return nil, err
	}
	p := cfg.PKI
	cert, key, err := p.IssueClient(short, "system:"+name)
	if err != nil {
		return nil, fmt.Errorf("issue the %s client certificate: %w", name, err)
	}
	kubeconfig := filepath.Join(e.Dir, short+".conf")
	if err := WriteKubeconfig(kubeconfig, cfg.Server, p.CACert, cert, key, ""); err != nil {
		return nil, err
	}
	ports, err := FreePorts(1)
	if err != nil {
		return nil, err
	}
	certDir := filepath.Join(e.Dir, short+"-serving")
	if err := ensureDir(certDir); err != nil {
		return nil, err
	}
	args := append([]string{
		"--kubeconfig=" + kubeconfig,
		"--authentication-kubeconfig=" + kubeconfig,
		"--authorization-kubeconfig=" + kubeconfig,
		"--bind-address=127.0.0.1",
		"--secure-port=" + itoa(ports[0]),
		"--cert-dir=" + certDir,
		"--client-ca-file=" + p.CACert,
		"--requestheader-client-ca-file=" + p.FrontProxyCACert,
		"--leader-elect=true",
		"--leader-elect-lease-duration=" + LeaseDuration.String(),
		"--leader-elect-renew-deadline=" + RenewDeadline.String(),
		"--leader-elect-retry-period=" + RetryPeriod.String(),
		"--profiling=false",
		"--v=1",
	}, own...)
	proc, err := e.Start(name, bin, append(args, cfg.ExtraArgs...))
	if err != nil {
		return nil, err
	}
	return &ControlPlaneComponent{
		Name: name, Lease: name, Kubeconfig: kubeconfig, Proc: proc,
		HealthURL: fmt.Sprintf("https://127.0.0.1:%d/healthz", ports[0]),
	}, nil
}

// LeaseState is what a leader-election Lease says.
type LeaseState struct {
	Holder      string
	Transitions int32
	AcquireTime time.Time
	RenewTime   time.Time
}

func (l LeaseState) String() string {
	return fmt.Sprintf("holder %q, %d transitions, acquired %s, renewed %s", l.Holder, l.Transitions,
		l.AcquireTime.Format(time.RFC3339Nano), l.RenewTime.Format(time.RFC3339Nano))
}

// ReadLease reads the Lease kube-system/name (coordination.k8s.io).
func ReadLease(ctx context.Context, cs kubernetes.Interface, name string) (LeaseState, error) {
	l, err := cs.CoordinationV1().Leases("kube-system").Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return LeaseState{}, fmt.Errorf("read lease kube-system/%s: %w", name, err)
	}
	var s LeaseState
	if l.Spec.HolderIdentity != nil {
		s.Holder = *l.Spec.HolderIdentity
	}
	if l.Spec.LeaseTransitions != nil {
		s.Transitions = *l.Spec.LeaseTransitions
	}
	if l.Spec.AcquireTime != nil {
		s.AcquireTime = l.Spec.AcquireTime.Time
	}
	if l.Spec.RenewTime != nil {
		s.RenewTime = l.Spec.RenewTime.Time
	}
	return s, nil
}

// WaitLeader waits until the component holds its Lease (read through cs) and says in its log
// that it acquired it, and returns the Lease.
func (c *ControlPlaneComponent) WaitLeader(ctx context.Context, cs kubernetes.Interface, timeout time.Duration) (LeaseState, error) {
	var s LeaseState
	var last, gone error
	err := wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		if gone = c.Restarted(); gone != nil {
			return false, gone
		}
		if !c.logContains(`Successfully acquired lease" lock="kube-system/` + c.Lease + `"`) {
			return false, nil
		}
		s, last = ReadLease(ctx, cs, c.Lease)
		return last == nil && s.Holder != "", nil
	})
	if gone != nil {
		return s, fmt.Errorf("%s never became leader: %w", c.Name, gone)
	}
	if err != nil {
		return s, fmt.Errorf("%s did not become leader within %s: %w (last read: %v); see %s", c.Name, timeout, err, last, c.Proc.LogPath)
	}
	return s, nil
}

// WaitRenewedAfter waits until the component's Lease, read through cs, was renewed after t,
// and returns it. A leader that stays renews every RetryPeriod.
func (c *ControlPlaneComponent) WaitRenewedAfter(ctx context.Context, cs kubernetes.Interface, t time.Time, timeout time.Duration) (LeaseState, error) {
	var s LeaseState
	var last, gone error
	err := wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		if gone = c.Restarted(); gone != nil {
			return false, gone
		}
		s, last = ReadLease(ctx, cs, c.Lease)
		return last == nil && s.RenewTime.After(t), nil
	})
	if gone != nil {
		return s, fmt.Errorf("%s stopped leading: %w", c.Name, gone)
	}
	if err != nil {
		return s, fmt.Errorf("%s lease not renewed after %s within %s: %w (last: %s, %v); see %s",
			c.Name, t.Format(time.RFC3339Nano), timeout, err, s, last, c.Proc.LogPath)
	}
	return s, nil
}

// Restarted reports, as an error naming the log, whether the component exited or logged that
// it lost its lease (after which it exits, and a supervisor would restart it).
func (c *ControlPlaneComponent) Restarted() error {
	if c.Proc.Exited() {
		return fmt.Errorf("%s exited; see %s", c.Name, c.Proc.LogPath)
	}
	for _, s := range []string{LeaderLost, renewFailed} {
		if c.logContains(s) {
			return fmt.Errorf("%s logged %q; see %s", c.Name, s, c.Proc.LogPath)
		}
	}
	return nil
}

// logContains reports whether the component's log holds s, ignoring case.
func (c *ControlPlaneComponent) logContains(s string) bool {
	b, err := os.ReadFile(c.Proc.LogPath)
	return err == nil && bytes.Contains(bytes.ToLower(b), bytes.ToLower([]byte(s)))
}

// Leader is a running kube-controller-manager or kube-scheduler with its Lease as it stood once
// it led steadily.
type Leader struct {
	C      *ControlPlaneComponent
	Before LeaseState
}

// StartLeaders starts kube-controller-manager and kube-scheduler as cfg says, waits until each
// holds its Lease (read through cs) and has renewed it once (steady state), and returns them.
func (e *Env) StartLeaders(ctx context.Context, cfg ControlPlaneConfig, cs kubernetes.Interface) ([]Leader, error) {
	kcm, err := e.StartControllerManager(cfg)
	if err != nil {
		return nil, err
	}
	sched, err := e.StartScheduler(cfg)
	if err != nil {
		return nil, err
	}
	var out []Leader
	for _, c := range []*ControlPlaneComponent{kcm, sched} {
		acquired, err := c.WaitLeader(ctx, cs, 2*time.Minute)
		if err != nil {
			return nil, err
		}
		before, err := c.WaitRenewedAfter(ctx, cs, acquired.RenewTime, LeaseDuration)
		if err != nil {
			return nil, err
		}
		out = append(out, Leader{C: c, Before: before})
	}
	return out, nil
}
