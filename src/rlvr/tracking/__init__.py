"""Run directories and what reads them: the manifest and atomic writes (`run_dir`), metric sinks
(`tracker`), the progress bar, loading and comparing runs with confidence intervals (`runs`,
`stats`, `plots`), the HTML report and export to a plain Hugging Face directory."""
