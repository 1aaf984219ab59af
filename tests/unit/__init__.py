"""Tests of one part at a time, in this process, with fakes where a part would be a process."""
