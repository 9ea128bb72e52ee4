"""Forensics: compare, localise and classify what a candidate did against the reference."""
