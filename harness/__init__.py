"""kvgraft benchmark harness."""
