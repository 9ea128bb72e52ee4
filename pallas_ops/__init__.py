"""The operator corpus: per operator a spec, a golden kernel and labelled near-miss variants."""
