//go:build e2e

package main

import (
	"bytes"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/kubefence/kubefence/e2e/framework"
)

// TestDemo runs `make demo`'s program, so that the demo cannot rot.
func TestDemo(t *testing.T) {
	framework.RequireBins(t, "etcd", framework.Etcd34, "etcd", framework.Etcd36, "etcdutl", framework.Etcd36, "kube-apiserver", framework.Kube136)
	framework.RequireBins(t, framework.ControlPlaneBins...)
	dir, err := os.MkdirTemp("", "kubefence-demo-")
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	// A hung cutover command fails the test in minutes, not at go test's -timeout.
	sum, err := run(t.Context(), options{dir: dir, objects: 100, writeRate: -1, cutoverBound: 5 * time.Minute}, &out)
	t.Log("\n" + out.String())
	if err != nil {
		t.Fatalf("demo failed: %v (logs in %s/logs)", err, dir)
	}
	defer os.RemoveAll(dir)
	if sum.WriterErrors != 0 || sum.PlainErrors != 0 || sum.PlainAcked == 0 || sum.ReadErr != 0 || sum.Verified < 100 || sum.WritesAcked == 0 {
		t.Errorf("summary = %+v", sum)
	}
	if len(sum.Leaders) != 2 || sum.Predicted <= 0 || sum.Window <= 0 || sum.Rollback <= 0 || sum.Again <= 0 {
		t.Errorf("leaders %v, predicted window %s, windows %s / %s / %s", sum.Leaders, sum.Predicted, sum.Window, sum.Rollback, sum.Again)
	}
	if !strings.Contains(out.String(), "acknowledged writes lost: 0") {
		t.Errorf("demo output lacks the summary")
	}
}
