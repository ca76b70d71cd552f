"""The job driver's side in scheduled mode: the phase API's runtime client, framework permits,
verl placement."""
