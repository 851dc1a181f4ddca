"""Published serving measurements replayed in the simulator (`capsim validate-published`)."""
