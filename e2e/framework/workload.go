package framework

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// CreateConfigMaps creates n configmaps named prefix-NNNNNN with a payload of size bytes in
// namespace ns, 16 at a time; it returns the first error.
func CreateConfigMaps(ctx context.Context, cs kubernetes.Interface, ns, prefix string, n, size int) error {
	payload := strings.Repeat("x", size)
	var next atomic.Int64
	errs := make(chan error, 16)
	var wg sync.WaitGroup
	for range 16 {
		wg.Go(func() {
			for i := next.Add(1) - 1; i < int64(n); i = next.Add(1) - 1 {
				cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("%s-%06d", prefix, i)}, Data: map[string]string{"payload": payload}}
				if _, err := cs.CoreV1().ConfigMaps(ns).Create(ctx, cm, metav1.CreateOptions{}); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	return <-errs
}
