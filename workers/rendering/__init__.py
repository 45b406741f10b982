"""What the CLI prints and plots: status, reports, progress, evaluation tables and plots."""
