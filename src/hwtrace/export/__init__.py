"""Views and exchange formats of hwtrace's results: self-contained HTML
pages (:mod:`.html`) and Chrome/Perfetto trace-event timelines
(:mod:`.timeline`)."""
