package pathguard

import "golang.org/x/sys/unix"

func bindMount(src, dst string) error { return unix.Mount(src, dst, "", unix.MS_BIND, "") }
func unmount(dir string)              { _ = unix.Unmount(dir, 0) }
