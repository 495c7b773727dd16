"""Pure functions from records to summaries: no torch, no lightning."""
