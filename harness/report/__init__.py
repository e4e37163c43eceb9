"""harness.report"""
