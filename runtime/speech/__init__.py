"""Speech to text: any audio decoded a block at a time (decode.py), recognised in windows by a
Whisper model (listen.py, through runtime/backend/whisper.py), and written as text, JSON,
SRT or WebVTT (transcript.py). `tallow transcribe` and serve's /v1/audio routes both drive
`listen.transcribe` (docs/DESIGN.md, "Speech to text")."""
