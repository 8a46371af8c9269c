"""Number formats: FP8 E4M3 arithmetic shared by the real engine and its fp32 emulation, so both
round the same way."""
