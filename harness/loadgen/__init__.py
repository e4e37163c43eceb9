"""harness.loadgen"""
