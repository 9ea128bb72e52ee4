"""Fixers propose edits to a failing kernel behind one small protocol (``base.Fixer``)."""
