"""The parity tier: mori's own op (the oracle) vs our runtime (the candidate), launch by launch, at the HIP ABI."""
