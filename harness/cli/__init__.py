"""harness.cli"""
