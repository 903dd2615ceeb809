"""The soak run (`run`) and the options it parses before torch loads (`options`)."""
