"""harness.workload"""
