from app.fakes.services import main

main()
