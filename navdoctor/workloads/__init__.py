"""Workloads bundled with navdoctor, to try `navdoctor diagnose` on without code of your own.

navigation: an AI-glasses navigation pipeline (JPEG camera frames -> CPU decode and
preprocessing -> blind-path/crosswalk segmentation and obstacle detection). Run it with
`python -m navdoctor.workloads.navigation --help`.
"""
