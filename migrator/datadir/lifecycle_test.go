package datadir

import (
	"testing"
)

func TestCheckDowngrade(t *testing.T) {
	det := func(v Version, st Storage) Detection {
		return Detection{Version: v, VersionString: v.String(), Storage: st, Source: VersionFileName}
	}
	for _, tc := range []struct {
		name    string
		cur     Detection
		target  Version
		wantErr []string // nil: allowed
	}{
		{name: "3.6 to 3.5", cur: det(Version{3, 6, 16}, StorageV3), target: Version{3, 5, 21}},
		{name: "3.6.0 to 3.5.0", cur: det(Version{3, 6, 0}, StorageV3), target: Version{3, 5, 0}},
		{name: "3.5 to 3.4", cur: det(Version{3, 5, 9}, StorageV3), target: Version{3, 4, 23},
			wantErr: []string{"3.6 to 3.5 only", "kubefence migrate restore-backup", "to 3.4"}},
		{name: "3.6 to 3.4", cur: det(Version{3, 6, 16}, StorageV3), target: Version{3, 4, 23},
			wantErr: []string{"3.6 to 3.5 only", "restore-backup"}},
		{name: "3.6 to 3.6", cur: det(Version{3, 6, 16}, StorageV3), target: Version{3, 6, 16},
			wantErr: []string{"not an older minor", "upgrade"}},
		{name: "3.6 to an older 3.6 patch", cur: det(Version{3, 6, 16}, StorageV3), target: Version{3, 6, 1},
			wantErr: []string{"not an older minor", "upgrade"}},
		{name: "3.5 to 3.6", cur: det(Version{3, 5, 9}, StorageV3), target: Version{3, 6, 16},
			wantErr: []string{"3.6.16 is not an older minor", "kubefence migrate upgrade"}},
		{name: "3.7 to 3.5", cur: det(Version{3, 7, 0}, StorageV3), target: Version{3, 5, 21},
			wantErr: []string{"one minor at a time", "downgrade to 3.6 first"}},
		{name: "3.7 to 3.6", cur: det(Version{3, 7, 0}, StorageV3), target: Version{3, 6, 16},
			wantErr: []string{"3.6 → 3.5 downgrade only"}},
		{name: "v2 storage", cur: det(Version{3, 6, 16}, StorageV2), target: Version{3, 5, 21},
			wantErr: []string{"v2 content", VersionFileName}},
		// 3.5 data may well hold v2 content; the way back to 3.4 is the backup either way.
		{name: "v2 storage 3.5 to 3.4", cur: det(Version{3, 5, 9}, StorageV2), target: Version{3, 4, 23},
			wantErr: []string{"3.6 to 3.5 only", "restore-backup"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := checkDowngrade(tc.cur, tc.target)
			if tc.wantErr == nil {
				if err != nil {
					t.Fatalf("checkDowngrade(%v → %v) = %v, want allowed", tc.cur.Version, tc.target, err)
				}
				return
			}
			assertErrContains(t, err, tc.wantErr...)
		})
	}
}
