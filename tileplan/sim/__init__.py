"""The IPU model: executes packages, checks every access, counts cycles, compares with float64."""
