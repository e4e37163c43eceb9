"""harness.engine"""
