package main

import (
	"os"
	"path/filepath"
	"time"

	"github.com/schollz/progressbar/v3"
)

// progress returns a load-progress callback that draws a bar on stderr for
// models of 256 MiB and more (smaller ones load too fast to need one).
func progress(path string) func(done, total int64) {
	var bar *progressbar.ProgressBar
	return func(done, total int64) {
		if total < 256<<20 {
			return
		}
		if bar == nil {
			bar = progressbar.NewOptions64(total,
				progressbar.OptionSetWriter(os.Stderr),
				progressbar.OptionSetDescription("loading "+filepath.Base(path)),
				progressbar.OptionShowBytes(true),
				progressbar.OptionClearOnFinish(),
				progressbar.OptionThrottle(100*time.Millisecond))
		}
		_ = bar.Set64(done)
		if done >= total {
			_ = bar.Finish()
		}
	}
}
