"""harness.results"""
